"""What the tool's two HTTP servers (the simulator and the recording proxy) share.

`fields` reads request bodies through checked accessors, `guard` bounds what a client can hold
(body size, read timeouts, idle connections, concurrency), `errors` answers in each API's own
error shape, `schema` is the OpenAPI document both publish. It imports nothing of `replay` but
`errors`: the simulator may not import the engine, and the recorder imports it freely, so the
layer both use sits below both.
"""
