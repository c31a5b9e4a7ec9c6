"""A module that is not a custom op library: it declares no OPS mapping."""

VERSION = 1
