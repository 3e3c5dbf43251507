"""The wire: one request's bytes between the proxy's two sockets, and nothing else.

``relay`` (one request, sent upstream once, its answer passed on read by read, returning one
frozen ``Outcome``) over ``upstream`` (the pooled HTTP/1.1 client to the engines, llhttp through
httptools) over ``answer`` (one answer's head and reads) and ``stamped`` (the upstream socket,
read with ``recvmsg`` and stamped by the kernel); on the client's side ``clientsock`` (its send
buffer capped) and ``writer`` (bytes beneath aiohttp's response writer); ``errors`` names what a
transport failure means.  It imports the measuring core and nothing else of the proxy.
"""
