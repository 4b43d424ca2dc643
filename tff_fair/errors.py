"""The error types a user can act on (plain Python: no TensorFlow, no TFF).

Every error caused by what a user asked for (a setting, a file named by a
flag, the data, a saved run directory) derives from `UserError`. A program
reports such an error as one message naming the setting or path and how to
fix it, without a traceback; any other exception is a bug of tff_fair and
keeps its traceback. `programs/train.py` holds the one table that maps these
types to exit codes.
"""


class UserError(Exception):
  """A bad setting, input file, data set or saved run: the user can fix it."""
