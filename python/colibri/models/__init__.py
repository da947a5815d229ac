"""Where models come from: named models and their cache (hub), what ``Model.load`` resolves
a name or path to (resolve), and the SmolLM2-derived demo MoE."""
