"""magi_lp.agent."""
