"""Structure-aware fuzzing of the files colibri reads (see docs/reliability.md).

codecs (gguf_codec, safetensors_codec) parse a seed into fields and write it back;
mutators change one field the way an attacker would; harness runs each mutant in a child
process with a memory cap and a timeout and classifies the outcome; campaign drives a
seeded run over the registered formats (formats.FORMATS) and audits every file opened.
"""
