"""Reading a trace: the formats (partui_format, kineto and its pandas-free readers kineto_arrays and
kineto_lean, op_table) and the one entry (reader: detect, load), with streaming (json_stream, streamed,
columns, column_parts), the parquet cache (trace_cache) and progress below them."""
