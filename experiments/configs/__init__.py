"""Run configurations: one ``get_config(arg)`` module per experiment (variants ``tiny``, ``paper``)."""
