"""The plumbing every capability shares: the compiled extensions and their FFI targets
(``extension``, ``ffi``), the GPU runtime libraries (``libs``) and which host NVSHMEM can run our
device code (``nvshmem_version``), the gates (``gates``: each says yes
or no with a reason), backend selection per op (``backends``), the verification record of the GPU
backends (``verified`` + ``verified.json``), ``explain``, the ``capabilities`` report, CPU features
(``cpu_features``), errors (``errors``), the environment variables (``env``) and the eager-call cache
and export checks of the ops (``eager``, ``export``).

May import: the standard library, jax / numpy, and other modules of ``common``. Never a capability
package (``formats``, ``dot``, ``collectives``, ``memory``, ``checkpoints``), not even inside a
function: a capability that adds to a common report registers itself (``capabilities.register_section``,
``backends.register``). tests/common/test_layout.py checks it.
"""
