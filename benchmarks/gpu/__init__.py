"""`make gpu-check` (check) and the search's cost against depth on a GPU (search_scale); the modules with a leading
underscore are the check's parts, imported by these two only."""
