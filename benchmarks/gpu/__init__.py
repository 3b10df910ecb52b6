"""`make gpu-check` (check); the modules with a leading underscore are its parts."""
