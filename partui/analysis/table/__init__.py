"""The analysis table and its interval arithmetic: a trace's complete events as one row per slice (events,
event_columns), and the one sweep over +1/-1 boundaries that every merged length comes from (sweep,
boundary_sweep)."""
