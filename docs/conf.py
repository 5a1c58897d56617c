# Sphinx configuration. Pages written as MyST notebooks (```{code-cell}```) are executed at
# every build (nb_execution_mode = "force"), so a tutorial that stops working fails the build.
# Pages that need a GPU are listed in nb_execution_excludepatterns instead of left to rot.
project = "jax-gpuext"
author = "jax-gpuext developers"
extensions = ["myst_nb"]
source_suffix = {".md": "myst-nb"}
exclude_patterns = ["_build"]
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_excludepatterns = []  # GPU-only pages go here
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3  # links such as gates.md#which-backend-will-i-get
html_theme = "alabaster"
suppress_warnings = ["myst.header"]
