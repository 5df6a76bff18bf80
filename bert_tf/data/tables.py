"""Parquet files and Arrow folders (datasets.save_to_disk) as corpus input: a row per document, its
text in one column and optionally a title in another. Row groups / record batches are the units
ranks share out (corpus.plan_shares); nothing loads a whole file: Parquet is read a row group at a
time, Arrow a record batch at a time, memory-mapped."""

from __future__ import annotations

import os

from bert_tf import ConfigError
from bert_tf.data.sentences import split_sentences


def arrow_folder_files(folder):
    """The Arrow stream files of a `datasets.save_to_disk` folder, from its state.json."""
    import json

    state = os.path.join(folder, "state.json")
    if not os.path.isfile(state):
        hint = (
            " (a DatasetDict: give one split's folder, e.g. train/)"
            if os.path.isfile(os.path.join(folder, "dataset_dict.json"))
            else ""
        )
        raise ConfigError(f"{folder}: no state.json: not a datasets.save_to_disk folder{hint}")
    try:
        with open(state) as f:
            files = [
                os.path.join(folder, entry["filename"]) for entry in json.load(f)["_data_files"]
            ]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{state}: not the layout datasets.save_to_disk writes (a list '_data_files' of "
            f"{{'filename': ...}}; another datasets version?): {e!r}"
        )
    for path in files:
        if not os.path.isfile(path):
            raise ConfigError(f"{state} names {path}, which does not exist")
    return files


def _open_table(path, kind):
    """(pyarrow reader, memory map or None) for a Parquet file or an Arrow stream file; errors name
    the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            return pq.ParquetFile(path), None
        mapped = pa.memory_map(path)
        return pa.ipc.open_stream(mapped), mapped
    except (pa.ArrowException, OSError) as e:
        what = "Parquet" if kind == "parquet" else "an Arrow stream (datasets.save_to_disk)"
        raise ConfigError(f"{path}: not a readable {what} file (corrupt or truncated?): {e}")


def _check_columns(path, schema, text_field, title_field):
    import pyarrow as pa

    for field in filter(None, (text_field, title_field)):
        if field not in schema.names:
            raise ConfigError(
                f"{path}: no column {field!r} (--text_field/--title_field); its columns: "
                f"{', '.join(schema.names)}"
            )
        if not (
            pa.types.is_string(schema.field(field).type)
            or pa.types.is_large_string(schema.field(field).type)
        ):
            raise ConfigError(
                f"{path}: column {field!r} holds {schema.field(field).type}, not text"
            )


def table_units(path, kind, text_field, title_field):
    """[(byte offset, unit number)]: a Parquet file's row groups (offset of its first column chunk)
    or an Arrow stream's record batches (offset in the memory-mapped file), after checking the
    columns."""
    import pyarrow as pa

    reader, mapped = _open_table(path, kind)
    _check_columns(
        path, reader.schema_arrow if kind == "parquet" else reader.schema, text_field, title_field
    )
    if kind == "parquet":
        meta = reader.metadata
        return [
            (
                min(
                    c.dictionary_page_offset or c.data_page_offset
                    for c in (meta.row_group(g).column(k) for k in range(meta.num_columns))
                ),
                g,
            )
            for g in range(meta.num_row_groups)
            if meta.row_group(g).num_rows
        ]
    units, offset = [], mapped.tell()
    while True:
        try:
            reader.read_next_batch()
        except StopIteration:
            return units
        except pa.ArrowException as e:
            raise ConfigError(
                f"{path}: the Arrow stream breaks off in record batch {len(units)} (truncated?): "
                f"{e}"
            )
        units.append((offset, len(units)))
        offset = mapped.tell()


def table_rows(share, stats):
    """(unit << 32 | row, sentences) for the rows of the share's row groups / record batches."""
    reader, _ = _open_table(share.path, share.fmt)
    columns = [c for c in (share.text_field, share.title_field) if c]
    stats.bytes_read += share.end - share.start
    if share.fmt == "parquet":
        batches = ((g, reader.read_row_group(g, columns=columns)) for g in share.streams)
    else:
        wanted = set(share.streams)
        batches = ((number, batch) for number, batch in enumerate(reader) if number in wanted)
    for unit, table in batches:
        texts = table.column(share.text_field).to_pylist()
        titles = (
            table.column(share.title_field).to_pylist()
            if share.title_field
            else [None] * len(texts)
        )
        for row, (text, title) in enumerate(zip(texts, titles)):
            if not isinstance(text, str):
                stats.bad_rows += 1
                stats.problems.append(
                    f"{share.path}: row {row} of "
                    f"{'row group' if share.fmt == 'parquet' else 'record batch'} {unit}: "
                    f"{share.text_field!r} is {text!r}, not text; skipped"
                )
                continue
            yield unit << 32 | row, ([title] if title else []) + split_sentences(text)
