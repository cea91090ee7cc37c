"""voxgate on Ray Serve: several engine replicas (one a GPU) behind Ray's proxy, with
WebSocket sessions routed to their replica by a consistent hash of the session key.

Optional (`pip install 'voxgate[ray]'`); imports serving, never the other way round."""
