"""Noise and parameters: randomness, Hadamard transforms, rotations, noise samplers and the parameter choices of every mechanism."""
