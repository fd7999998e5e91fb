"""Kernels: a jnp reference (the specification), Pallas TPU and GPU kernels, and a dispatching api per op."""
