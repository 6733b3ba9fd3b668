module github.com/shale-db/shale

go 1.26.8

require (
	github.com/cockroachdb/datadriven v1.0.3
	github.com/golang/snappy v1.0.0
	github.com/klauspost/compress v1.20.3
	github.com/spf13/cobra v1.10.2
	go.uber.org/goleak v1.3.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
)
