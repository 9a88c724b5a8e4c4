"""What every open1b package shares, and nothing else: the root of the project's errors
(``errors``), canonical JSON (``canonical``), reading files others wrote (``safeio``) and
the shell of the three command-line tools (``cli``). Imports nothing of the project;
``kernels`` (a leaf) does not import it either.
"""
