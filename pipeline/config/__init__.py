"""Typed pipeline configuration: structured-config schemas, composition of `conf/`, validation."""
