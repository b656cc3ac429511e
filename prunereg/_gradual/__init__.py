"""Gradual pruning during training: schedules, one mask per parameter replaced in place, rewinding, callbacks."""
