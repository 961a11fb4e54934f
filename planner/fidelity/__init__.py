"""How well the planner's predictions agree with training runs that were measured on real GPUs."""
