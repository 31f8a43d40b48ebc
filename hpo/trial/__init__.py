"""What runs inside a trial's job: the objective, the reporter to Optuna, the task, the worker loop."""
