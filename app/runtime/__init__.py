"""What a long-running batchyard process runs on, under the domain's packages: one polling thread
(`polling`), JSON on every line's path (`jsoncodec`), start-up frozen out of the garbage
collector's walks (`heap`), and one log format (`logs`)."""
