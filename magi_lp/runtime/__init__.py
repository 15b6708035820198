"""magi_lp.runtime."""
