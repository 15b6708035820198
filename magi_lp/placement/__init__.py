"""magi_lp.placement."""
