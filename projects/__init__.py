"""Agent projects written against the magi_lp builder API."""
