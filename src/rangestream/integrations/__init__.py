"""Glue for training frameworks (transformers, accelerate, Lightning).

Each module imports its framework only when used, so the base install stays light."""
