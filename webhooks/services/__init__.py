"""Services of the delivery side: functions that write (HackSoft style)."""
