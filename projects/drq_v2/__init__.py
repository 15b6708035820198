"""DrQ-v2 (Yarats et al. 2021) on the magi_lp builder API."""
