-- The tables batchyard 0.1.0's create_all made on sqlite (app/models.py at 77d2e77).
CREATE TABLE batch (
	id VARCHAR NOT NULL, 
	owner VARCHAR NOT NULL, 
	endpoint VARCHAR NOT NULL, 
	input_file_id VARCHAR NOT NULL, 
	completion_window VARCHAR NOT NULL, 
	status VARCHAR NOT NULL, 
	model VARCHAR, 
	metadata TEXT, 
	errors TEXT, 
	output_file_id VARCHAR, 
	error_file_id VARCHAR, 
	output_expires_after INTEGER, 
	created_at INTEGER NOT NULL, 
	created_ns INTEGER NOT NULL, 
	expires_at INTEGER, 
	in_progress_at INTEGER, 
	finalizing_at INTEGER, 
	completed_at INTEGER, 
	failed_at INTEGER, 
	expired_at INTEGER, 
	cancelling_at INTEGER, 
	cancelled_at INTEGER, 
	total INTEGER NOT NULL, 
	completed INTEGER NOT NULL, 
	failed INTEGER NOT NULL, 
	input_tokens INTEGER NOT NULL, 
	output_tokens INTEGER NOT NULL, 
	PRIMARY KEY (id)
);
CREATE INDEX ix_batch_created_ns ON batch (created_ns);
CREATE INDEX ix_batch_input_file_id ON batch (input_file_id);
CREATE INDEX ix_batch_owner ON batch (owner);
CREATE INDEX ix_batch_status ON batch (status);
CREATE TABLE file (
	id VARCHAR NOT NULL, 
	owner VARCHAR NOT NULL, 
	filename VARCHAR NOT NULL, 
	purpose VARCHAR NOT NULL, 
	bytes INTEGER NOT NULL, 
	sha256 VARCHAR NOT NULL, 
	created_at INTEGER NOT NULL, 
	created_ns INTEGER NOT NULL, 
	expires_at INTEGER, 
	PRIMARY KEY (id)
);
CREATE INDEX ix_file_created_ns ON file (created_ns);
CREATE INDEX ix_file_owner ON file (owner);
CREATE INDEX ix_file_purpose ON file (purpose);
CREATE TABLE request (
	id VARCHAR NOT NULL, 
	batch_id VARCHAR NOT NULL, 
	line INTEGER NOT NULL, 
	custom_id VARCHAR NOT NULL, 
	"offset" INTEGER NOT NULL, 
	length INTEGER NOT NULL, 
	status VARCHAR NOT NULL, 
	attempts INTEGER NOT NULL, 
	claimed_by VARCHAR, 
	claimed_at INTEGER, 
	lease_until FLOAT, 
	finished_at INTEGER, 
	status_code INTEGER, 
	request_id VARCHAR, 
	body TEXT, 
	error TEXT, 
	prompt_tokens INTEGER NOT NULL, 
	completion_tokens INTEGER NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(batch_id) REFERENCES batch (id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX ix_request_batch_line ON request (batch_id, line);
CREATE INDEX ix_request_batch_status ON request (batch_id, status);
