"""gazctl (the command-line tool)."""

import os

# gRPC's core logs failed TLS handshakes (and other connection events) to stderr at INFO level
# unless told otherwise, when it is first imported: gazctl reports every failure as one line of
# its own, so only gRPC's errors may add to it.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
