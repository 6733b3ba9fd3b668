package storage

// LastSeq returns the sequence number of the last write visible to readers
// (0 before the first): UpdatesSince(LastSeq()+1) starts after every write
// made so far.
func (d *DB) LastSeq() SeqNum { return SeqNum(d.visibleSeq.Load()) }
