"""What ``verify`` checks besides the patch verdicts, on the controller: every call
speculators makes into vLLM (``callsite``), the attributes it reads (``attribute_reads``),
the generator's import path (``import_path``), the model runner vLLM builds
(``model_runner``), the same calls on the live objects (``runtime``, ``verify --runtime``),
the releases with an engine proof (``proven``); ``verify`` puts them together, and
``calls_cache`` keeps their findings for the next run on the same files."""
