// Package backup writes Shale backups to a location (a local or mounted
// directory) and reads, verifies, lists and deletes them.
//
// # Layout
//
// A location holds any number of backups of one or more clusters:
//
//	LOCATION/
//	  lock                               held while a backup is written or deleted
//	  backups/<id>/manifest.json         written last: a backup without one is incomplete
//	  files/shard-<n>/<name>.<size>.<crc> one file of shard n's checkpoints
//
// A backup is, for every shard, a checkpoint of one of its replicas (a
// follower's when one answers) at that replica's applied index: the
// storage engine's immutable files. They are stored once per location
// under a name that carries their size and CRC-32C, so a file an earlier
// backup copied is not copied again, and backups share it. The manifest
// lists every shard's part (range, descriptor, applied index and term, the
// date of its last entry, its files) and carries a CRC-32C of its own body;
// it is renamed into place only after every file is synced, so a backup
// that failed half-way is never taken for a complete one.
//
// Each node writes its own checkpoints into the location
// (Admin.BackupShardTo, Location.StoreCheckpoint) and Create only
// coordinates and writes the manifest; a node that cannot streams its
// checkpoints through Create (Admin.BackupShard), which stores them.
//
// Every byte is checked: a node names each file it stores by the CRC-32C
// computed as it writes or uploads it; each chunk a node streams carries a
// CRC-32C, each file its whole-file CRC-32C, checked before it is stored;
// Verify reads every stored file of a backup again and checks its size and
// checksum.
package backup
