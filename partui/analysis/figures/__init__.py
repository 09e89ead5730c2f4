"""The figures computed from the table: every figure defined once (definitions); overlap, exposed comm,
idle and bubble (metrics, cpu, pipeline, timing, schedule_view); GPU streams (streams); memory; routing;
F&B pairs (pairs, kineto_pairs, pair_plan)."""
