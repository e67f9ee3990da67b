"""The ``genprobe loops`` actions, one module each (the ``loops`` parser is ``cmd_loops``)."""
