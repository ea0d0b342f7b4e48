"""Benchmarks of dpgate (not tests): data generators, timing and accuracy runs.

Run modules with ``python -m bench.<module>`` from the project root.
"""
