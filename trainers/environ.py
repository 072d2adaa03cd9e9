"""The one lock around this process's environment (`os.environ`), which its threads share: every edit of
it holds `environ_lock`, the trainers' (`trainers.numerics.use`, the NRU loops' build) and the service's
(the process settings of Ray and MLflow; `service.core.processes`, which also holds it while a block's
child processes start and while it reads the environment whole for a child), so that no thread starts a process, or reads the environment, in the
middle of another's edit."""

from __future__ import annotations

import threading

#: reentrant: `service.core.processes`'s blocks nest, and an edit may start inside one
environ_lock = threading.RLock()
