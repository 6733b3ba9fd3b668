package manifest

import (
	"strconv"
	"strings"

	"github.com/shale-db/shale/storage/vfs"
)

// FileType is the kind of a file in a database directory, as told by its
// name.
type FileType int

// The file types and their names (NNNNNN is the file number, zero-padded to
// at least six digits).
const (
	FileTypeLog      FileType = iota + 1 // NNNNNN.log, a WAL
	FileTypeTable                        // NNNNNN.sst, an SST
	FileTypeManifest                     // MANIFEST-NNNNNN
	FileTypeCurrent                      // CURRENT, names the live MANIFEST
	FileTypeLock                         // LOCK, the directory lock
	FileTypeTemp                         // NNNNNN.dbtmp, a file being written before a rename
	FileTypeOptions                      // OPTIONS-NNNNNN
)

// String returns the type's name ("log", "table", ...).
func (t FileType) String() string {
	switch t {
	case FileTypeLog:
		return "log"
	case FileTypeTable:
		return "table"
	case FileTypeManifest:
		return "manifest"
	case FileTypeCurrent:
		return "current"
	case FileTypeLock:
		return "lock"
	case FileTypeTemp:
		return "temp"
	case FileTypeOptions:
		return "options"
	}
	return "FileType(" + strconv.Itoa(int(t)) + ")"
}

// MakeFilename returns the name (not path) of the file of type ft and number
// num. num is ignored for CURRENT and LOCK. It returns "" for an unknown
// type.
func MakeFilename(ft FileType, num FileNum) string {
	switch ft {
	case FileTypeLog:
		return num.String() + ".log"
	case FileTypeTable:
		return num.String() + ".sst"
	case FileTypeManifest:
		return "MANIFEST-" + num.String()
	case FileTypeCurrent:
		return "CURRENT"
	case FileTypeLock:
		return "LOCK"
	case FileTypeTemp:
		return num.String() + ".dbtmp"
	case FileTypeOptions:
		return "OPTIONS-" + num.String()
	}
	return ""
}

// MakeFilepath joins dir and MakeFilename(ft, num) with fs's separator.
func MakeFilepath(fs vfs.FS, dir string, ft FileType, num FileNum) string {
	return fs.Join(dir, MakeFilename(ft, num))
}

// ParseFilename parses a file name (not a path) produced by MakeFilename. ok
// is false for any other name, including non-canonical spellings such as
// "5.sst" or "0000005.sst", so that foreign files in a database directory
// are never mistaken for (and deleted as) engine files. num is 0 for
// CURRENT and LOCK.
func ParseFilename(name string) (ft FileType, num FileNum, ok bool) {
	switch name {
	case "CURRENT":
		return FileTypeCurrent, 0, true
	case "LOCK":
		return FileTypeLock, 0, true
	}
	var digits string
	switch {
	case strings.HasPrefix(name, "MANIFEST-"):
		ft, digits = FileTypeManifest, name[len("MANIFEST-"):]
	case strings.HasPrefix(name, "OPTIONS-"):
		ft, digits = FileTypeOptions, name[len("OPTIONS-"):]
	case strings.HasSuffix(name, ".log"):
		ft, digits = FileTypeLog, name[:len(name)-len(".log")]
	case strings.HasSuffix(name, ".sst"):
		ft, digits = FileTypeTable, name[:len(name)-len(".sst")]
	case strings.HasSuffix(name, ".dbtmp"):
		ft, digits = FileTypeTemp, name[:len(name)-len(".dbtmp")]
	default:
		return 0, 0, false
	}
	if digits == "" || digits[0] < '0' || digits[0] > '9' {
		return 0, 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || FileNum(n).String() != digits {
		return 0, 0, false
	}
	return ft, FileNum(n), true
}
