package main

// An in-memory ML Metadata store behind the real gRPC MetadataStoreService, so that the driver's own metadata
// client (backend/src/v2/metadata/client.go) stores and reads executions, artifacts, contexts and events through
// it. It keeps what it is given and answers from that; it serves the RPCs that client calls (the `c.svc.` calls
// of client.go at the release) and fails loudly on anything else (UnimplementedMetadataStoreServiceServer).
// Semantics follow ml-metadata's metadata_store_service.proto: types are upserted by name, ids are assigned from
// 1, contexts are unique by (type, name), a missing type is NOT_FOUND, and a missing context is an empty answer.

import (
	"context"
	"net"
	"regexp"
	"strconv"
	"sync"

	pb "github.com/kubeflow/pipelines/third_party/ml-metadata/go/ml_metadata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

type memoryMLMD struct {
	pb.UnimplementedMetadataStoreServiceServer
	mu            sync.Mutex
	nextID        int64
	executionType map[string]*pb.ExecutionType
	artifactType  map[string]*pb.ArtifactType
	contextType   map[string]*pb.ContextType
	executions    map[int64]*pb.Execution
	artifacts     map[int64]*pb.Artifact
	contexts      map[int64]*pb.Context
	events        []*pb.Event
	parents       map[int64][]int64 // child context -> parent contexts
	associations  map[int64][]int64 // context -> executions
	attributions  map[int64][]int64 // context -> artifacts
}

func newMemoryMLMD() *memoryMLMD {
	return &memoryMLMD{executionType: map[string]*pb.ExecutionType{}, artifactType: map[string]*pb.ArtifactType{},
		contextType: map[string]*pb.ContextType{}, executions: map[int64]*pb.Execution{},
		artifacts: map[int64]*pb.Artifact{}, contexts: map[int64]*pb.Context{}, parents: map[int64][]int64{},
		associations: map[int64][]int64{}, attributions: map[int64][]int64{}}
}

// serve starts the store on a loopback port and returns its address and port.
func (s *memoryMLMD) serve() (string, string, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", err
	}
	server := grpc.NewServer()
	pb.RegisterMetadataStoreServiceServer(server, s)
	go server.Serve(listener) //nolint:errcheck
	host, port, err := net.SplitHostPort(listener.Addr().String())
	return host, port, err
}

func (s *memoryMLMD) id() int64 { s.nextID++; return s.nextID }

func (s *memoryMLMD) PutExecutionType(_ context.Context, r *pb.PutExecutionTypeRequest) (*pb.PutExecutionTypeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := r.GetExecutionType()
	if old, ok := s.executionType[t.GetName()]; ok {
		return &pb.PutExecutionTypeResponse{TypeId: old.Id}, nil
	}
	t = proto.Clone(t).(*pb.ExecutionType)
	t.Id = proto.Int64(s.id())
	s.executionType[t.GetName()] = t
	return &pb.PutExecutionTypeResponse{TypeId: t.Id}, nil
}

func (s *memoryMLMD) PutArtifactType(_ context.Context, r *pb.PutArtifactTypeRequest) (*pb.PutArtifactTypeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := r.GetArtifactType()
	if old, ok := s.artifactType[t.GetName()]; ok {
		return &pb.PutArtifactTypeResponse{TypeId: old.Id}, nil
	}
	t = proto.Clone(t).(*pb.ArtifactType)
	t.Id = proto.Int64(s.id())
	s.artifactType[t.GetName()] = t
	return &pb.PutArtifactTypeResponse{TypeId: t.Id}, nil
}

func (s *memoryMLMD) PutContextType(_ context.Context, r *pb.PutContextTypeRequest) (*pb.PutContextTypeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := r.GetContextType()
	if old, ok := s.contextType[t.GetName()]; ok {
		return &pb.PutContextTypeResponse{TypeId: old.Id}, nil
	}
	t = proto.Clone(t).(*pb.ContextType)
	t.Id = proto.Int64(s.id())
	s.contextType[t.GetName()] = t
	return &pb.PutContextTypeResponse{TypeId: t.Id}, nil
}

func (s *memoryMLMD) GetContextType(_ context.Context, r *pb.GetContextTypeRequest) (*pb.GetContextTypeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.contextType[r.GetTypeName()]; ok {
		return &pb.GetContextTypeResponse{ContextType: t}, nil
	}
	return nil, status.Errorf(codes.NotFound, "no context type %q", r.GetTypeName())
}

func (s *memoryMLMD) GetArtifactType(_ context.Context, r *pb.GetArtifactTypeRequest) (*pb.GetArtifactTypeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.artifactType[r.GetTypeName()]; ok {
		return &pb.GetArtifactTypeResponse{ArtifactType: t}, nil
	}
	return nil, status.Errorf(codes.NotFound, "no artifact type %q", r.GetTypeName())
}

func (s *memoryMLMD) typeNameOf(id int64) string {
	for _, t := range s.contextType {
		if t.GetId() == id {
			return t.GetName()
		}
	}
	for _, t := range s.executionType {
		if t.GetId() == id {
			return t.GetName()
		}
	}
	for _, t := range s.artifactType {
		if t.GetId() == id {
			return t.GetName()
		}
	}
	return ""
}

func (s *memoryMLMD) GetContextByTypeAndName(_ context.Context, r *pb.GetContextByTypeAndNameRequest) (*pb.GetContextByTypeAndNameResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.contexts {
		if c.GetType() == r.GetTypeName() && c.GetName() == r.GetContextName() {
			return &pb.GetContextByTypeAndNameResponse{Context: c}, nil
		}
	}
	return &pb.GetContextByTypeAndNameResponse{}, nil
}

func (s *memoryMLMD) putContext(c *pb.Context) (int64, error) {
	if c.Id != nil {
		if _, ok := s.contexts[c.GetId()]; !ok {
			return 0, status.Errorf(codes.NotFound, "no context %d", c.GetId())
		}
		s.contexts[c.GetId()] = proto.Clone(c).(*pb.Context)
		return c.GetId(), nil
	}
	for _, old := range s.contexts {
		if old.GetTypeId() == c.GetTypeId() && old.GetName() == c.GetName() {
			return 0, status.Errorf(codes.AlreadyExists, "context %q exists", c.GetName())
		}
	}
	c = proto.Clone(c).(*pb.Context)
	c.Id = proto.Int64(s.id())
	c.Type = proto.String(s.typeNameOf(c.GetTypeId()))
	s.contexts[c.GetId()] = c
	return c.GetId(), nil
}

func (s *memoryMLMD) PutContexts(_ context.Context, r *pb.PutContextsRequest) (*pb.PutContextsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.PutContextsResponse{}
	for _, c := range r.GetContexts() {
		id, err := s.putContext(c)
		if err != nil {
			return nil, err
		}
		response.ContextIds = append(response.ContextIds, id)
	}
	return response, nil
}

func (s *memoryMLMD) PutParentContexts(_ context.Context, r *pb.PutParentContextsRequest) (*pb.PutParentContextsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range r.GetParentContexts() {
		s.parents[p.GetChildId()] = append(s.parents[p.GetChildId()], p.GetParentId())
	}
	return &pb.PutParentContextsResponse{}, nil
}

func (s *memoryMLMD) GetParentContextsByContext(_ context.Context, r *pb.GetParentContextsByContextRequest) (*pb.GetParentContextsByContextResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.GetParentContextsByContextResponse{}
	for _, id := range s.parents[r.GetContextId()] {
		response.Contexts = append(response.Contexts, s.contexts[id])
	}
	return response, nil
}

func (s *memoryMLMD) GetContextsByID(_ context.Context, r *pb.GetContextsByIDRequest) (*pb.GetContextsByIDResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.GetContextsByIDResponse{}
	for _, id := range r.GetContextIds() {
		if c, ok := s.contexts[id]; ok {
			response.Contexts = append(response.Contexts, c)
		}
	}
	return response, nil
}

func (s *memoryMLMD) contextsHolding(links map[int64][]int64, id int64) []*pb.Context {
	var found []*pb.Context
	for contextID, ids := range links {
		for _, held := range ids {
			if held == id {
				found = append(found, s.contexts[contextID])
				break
			}
		}
	}
	return found
}

func (s *memoryMLMD) GetContextsByExecution(_ context.Context, r *pb.GetContextsByExecutionRequest) (*pb.GetContextsByExecutionResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &pb.GetContextsByExecutionResponse{Contexts: s.contextsHolding(s.associations, r.GetExecutionId())}, nil
}

func (s *memoryMLMD) GetContextsByArtifact(_ context.Context, r *pb.GetContextsByArtifactRequest) (*pb.GetContextsByArtifactResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &pb.GetContextsByArtifactResponse{Contexts: s.contextsHolding(s.attributions, r.GetArtifactId())}, nil
}

func (s *memoryMLMD) putArtifact(a *pb.Artifact) int64 {
	a = proto.Clone(a).(*pb.Artifact)
	if a.Id == nil {
		a.Id = proto.Int64(s.id())
	}
	a.Type = proto.String(s.typeNameOf(a.GetTypeId()))
	s.artifacts[a.GetId()] = a
	return a.GetId()
}

func (s *memoryMLMD) PutArtifacts(_ context.Context, r *pb.PutArtifactsRequest) (*pb.PutArtifactsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.PutArtifactsResponse{}
	for _, a := range r.GetArtifacts() {
		response.ArtifactIds = append(response.ArtifactIds, s.putArtifact(a))
	}
	return response, nil
}

func link(links map[int64][]int64, contextID, id int64) {
	for _, held := range links[contextID] {
		if held == id {
			return
		}
	}
	links[contextID] = append(links[contextID], id)
}

// PutExecution stores the execution, its artifacts and events, and links all of them to the given contexts
// (creating those without an id), as one MLMD transaction does.
func (s *memoryMLMD) PutExecution(_ context.Context, r *pb.PutExecutionRequest) (*pb.PutExecutionResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := proto.Clone(r.GetExecution()).(*pb.Execution)
	if e.Id == nil {
		// Executions are unique by (type, name), as ML Metadata's schema makes them; the driver relies on the
		// AlreadyExists that a retried pod gets (driver/container_test.go TestContainer_CreateExecution* at 2.17.0).
		for _, old := range s.executions {
			if e.GetName() != "" && old.GetTypeId() == e.GetTypeId() && old.GetName() == e.GetName() {
				return nil, status.Errorf(codes.AlreadyExists, "execution %q exists", e.GetName())
			}
		}
		e.Id = proto.Int64(s.id())
	} else if _, ok := s.executions[e.GetId()]; !ok {
		return nil, status.Errorf(codes.NotFound, "no execution %d", e.GetId())
	}
	e.Type = proto.String(s.typeNameOf(e.GetTypeId()))
	s.executions[e.GetId()] = e
	response := &pb.PutExecutionResponse{ExecutionId: e.Id}
	for _, pair := range r.GetArtifactEventPairs() {
		artifactID := pair.GetEvent().GetArtifactId()
		if pair.GetArtifact() != nil {
			artifactID = s.putArtifact(pair.GetArtifact())
		}
		response.ArtifactIds = append(response.ArtifactIds, artifactID)
		if pair.GetEvent() != nil {
			event := proto.Clone(pair.GetEvent()).(*pb.Event)
			event.ArtifactId = proto.Int64(artifactID)
			event.ExecutionId = e.Id
			s.events = append(s.events, event)
		}
	}
	for _, c := range r.GetContexts() {
		contextID := c.GetId()
		if c.Id == nil {
			existing := int64(0)
			for id, old := range s.contexts {
				if old.GetTypeId() == c.GetTypeId() && old.GetName() == c.GetName() {
					existing = id
				}
			}
			if existing == 0 {
				var err error
				if existing, err = s.putContext(c); err != nil {
					return nil, err
				}
			}
			contextID = existing
		}
		response.ContextIds = append(response.ContextIds, contextID)
		link(s.associations, contextID, e.GetId())
		for _, artifactID := range response.ArtifactIds {
			link(s.attributions, contextID, artifactID)
		}
	}
	return response, nil
}

func (s *memoryMLMD) GetExecutionsByID(_ context.Context, r *pb.GetExecutionsByIDRequest) (*pb.GetExecutionsByIDResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.GetExecutionsByIDResponse{}
	for _, id := range r.GetExecutionIds() {
		if e, ok := s.executions[id]; ok {
			response.Executions = append(response.Executions, e)
		}
	}
	return response, nil
}

func (s *memoryMLMD) GetExecutionByTypeAndName(_ context.Context, r *pb.GetExecutionByTypeAndNameRequest) (*pb.GetExecutionByTypeAndNameResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.executions {
		if e.GetType() == r.GetTypeName() && e.GetName() == r.GetExecutionName() {
			return &pb.GetExecutionByTypeAndNameResponse{Execution: e}, nil
		}
	}
	return &pb.GetExecutionByTypeAndNameResponse{}, nil
}

// The one filter the driver's client sends (client.go GetExecutionsInDAG).
var parentDAGFilter = regexp.MustCompile(`^custom_properties\.parent_dag_id\.int_value = (\d+)$`)

func (s *memoryMLMD) GetExecutionsByContext(_ context.Context, r *pb.GetExecutionsByContextRequest) (*pb.GetExecutionsByContextResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	filter := r.GetOptions().GetFilterQuery()
	parent := int64(-1)
	if filter != "" {
		match := parentDAGFilter.FindStringSubmatch(filter)
		if match == nil {
			return nil, status.Errorf(codes.Unimplemented, "filter %q is not one this store knows", filter)
		}
		parent, _ = strconv.ParseInt(match[1], 10, 64)
	}
	response := &pb.GetExecutionsByContextResponse{}
	for _, id := range s.associations[r.GetContextId()] {
		e := s.executions[id]
		if parent >= 0 && e.GetCustomProperties()["parent_dag_id"].GetIntValue() != parent {
			continue
		}
		response.Executions = append(response.Executions, e)
	}
	return response, nil
}

func (s *memoryMLMD) GetEventsByExecutionIDs(_ context.Context, r *pb.GetEventsByExecutionIDsRequest) (*pb.GetEventsByExecutionIDsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.GetEventsByExecutionIDsResponse{}
	for _, event := range s.events {
		for _, id := range r.GetExecutionIds() {
			if event.GetExecutionId() == id {
				response.Events = append(response.Events, event)
			}
		}
	}
	return response, nil
}

func (s *memoryMLMD) GetEventsByArtifactIDs(_ context.Context, r *pb.GetEventsByArtifactIDsRequest) (*pb.GetEventsByArtifactIDsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.GetEventsByArtifactIDsResponse{}
	for _, event := range s.events {
		for _, id := range r.GetArtifactIds() {
			if event.GetArtifactId() == id {
				response.Events = append(response.Events, event)
			}
		}
	}
	return response, nil
}

func (s *memoryMLMD) GetArtifactsByID(_ context.Context, r *pb.GetArtifactsByIDRequest) (*pb.GetArtifactsByIDResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.GetArtifactsByIDResponse{}
	for _, id := range r.GetArtifactIds() {
		if a, ok := s.artifacts[id]; ok {
			response.Artifacts = append(response.Artifacts, a)
		}
	}
	return response, nil
}

func (s *memoryMLMD) GetArtifactsByURI(_ context.Context, r *pb.GetArtifactsByURIRequest) (*pb.GetArtifactsByURIResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	response := &pb.GetArtifactsByURIResponse{}
	for _, a := range s.artifacts {
		for _, uri := range r.GetUris() {
			if a.GetUri() == uri {
				response.Artifacts = append(response.Artifacts, a)
			}
		}
	}
	return response, nil
}
