"""Herald's PostgreSQL database backend (config/db/base.py)."""
