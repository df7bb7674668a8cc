"""The grader's side of every lab: references, checks and hidden checks.

Never importable inside a submission's sandbox (this folder is replaced there by an empty one): a
submission sees only the labs' contract modules (``dtrain_lab.grading.lab10``, ...).
"""
