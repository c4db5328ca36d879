"""Predict: pure functions of configs and degrees. Nothing here starts a process or imports torch."""
