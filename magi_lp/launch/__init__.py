"""magi_lp.launch."""
