module cellplane.local/pause

go 1.26
