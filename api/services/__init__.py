"""What the endpoints do, apart from HTTP: plan creation with dedup and idempotency, listing queries."""
