"""Typed settings: the frozen, validated configuration classes (EngineConfig and its parts,
SpecConfig) and the field machinery they are built from. Nothing here reads the
environment or probes the machine unless a method is asked to."""
