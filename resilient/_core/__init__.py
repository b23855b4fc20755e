"""
The pure core of resilient: no I/O, no sleeping, no awaiting.

Every other module is written in terms of what this package exposes.
"""
