package main

import (
	"github.com/spf13/cobra"

	"github.com/shale-db/shale/cmd/shalectl/internal/output"
)

// debugFlags are the flags shared by every debug command.
type debugFlags struct {
	*globalFlags
	hex bool
}

// codec returns the key/value codec the --hex flag selects.
func (d *debugFlags) codec() output.Codec { return output.Codec{Hex: d.hex} }

// newDebugCmd builds the "debug" command group: offline tools that work on
// storage engine files directly.
func newDebugCmd(g *globalFlags) *cobra.Command {
	d := &debugFlags{globalFlags: g}
	cmd := &cobra.Command{
		Use:   "debug",
		Short: "Inspect and edit storage engine files offline",
		Long: `The debug commands work on a storage engine directory or SST file directly,
without a running server, in the manner of RocksDB's sst_dump and ldb.

Keys and values are strings by default; with --hex they are read and printed
as hexadecimal (0x prefix optional on input, always present on output).`,
		Args: noArgs,
		RunE: groupHelp,
	}
	cmd.PersistentFlags().BoolVar(&d.hex, "hex", false, "read and print keys and values as hexadecimal")
	cmd.AddCommand(newSSTDumpCmd(d), newLDBCmd(d))
	return cmd
}
