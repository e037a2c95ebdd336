"""The ground floor: small helpers that every other package may use (it imports none of them)."""
