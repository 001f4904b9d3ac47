#!/bin/sh
# Run by the minio-init service of docker-compose.yml: create the bucket, upload the sample.
set -eu
mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"
mc mb --ignore-existing "local/$BUCKET"
mc mirror --overwrite /fixtures/sample-tokens "local/$BUCKET/sample-tokens"
echo "sample dataset at s3://$BUCKET/sample-tokens"
