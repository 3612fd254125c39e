"""Training drafters for a model: ``draftwise train-drafter`` (``recipe.py``).

It drives the torch backend (``backends/cuda``) and lives outside it:
``recipe.py`` (``TrainRecipe``, ``train_redrafter``), ``distill.py`` (the model's own
greedy continuations as training data), ``fit.py`` (the training loop) and
``batch_greedy.py`` (batched greedy generation with hidden states).
"""
