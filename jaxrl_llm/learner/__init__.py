"""Learner: TrainState, optimiser, jitted train steps, SFT and RL loops, checkpoints."""
