"""The `Idempotency-Key` layer (SPEC §3): parse, fingerprint, acquire, complete, replay."""
