"""Drop-in integrations of PAL's sum tree into other RL libraries (import each submodule on its own)."""
