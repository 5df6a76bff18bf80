"""Training: one optimizer update, the optimizers, pre-training (config, build, loop, evaluation),
elastic mode, the divergence guard, time budgets."""
