"""The HTTP edge: the client route table, request bodies and their deadlines, multipart
uploads, the disconnect watch and error replies in the client's protocol."""
