"""``python -m eval``: the command-line entry point of mars.eval (see mars/eval/cli.py).

eval/tasks/ holds the project's own lm-eval tasks (mars_quiz), always on lm-eval's search path.
"""
