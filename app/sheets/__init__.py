"""Spreadsheets in, spreadsheets out: a batch from a CSV, TSV or XLSX sheet and a template.

`reading` streams a sheet's rows, `requests` renders one request line per row, `writing`
joins a finished batch's output and error files back to the rows, and `service` ties them
to the files and batches services, so that a sheet's batch is an ordinary batch.
"""
